//===- stage.h - Stage description and manifest -----------------*- C++ -*-===//
//
// Part of pipec's runtime core. The documents themselves (structs, readers,
// writers) are the formats library's (pipec/formats/Documents.h), shared
// with the compiler; the runtime names them here.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_RUNTIME_CORE_STAGE_H
#define PIPEC_RUNTIME_CORE_STAGE_H

#include "pipec/formats/Documents.h"

namespace pipec {
namespace rt {

using formats::checkManifest;
using formats::FeedSpec;
using formats::FusedUpdate;
using formats::Manifest;
using formats::ManifestStage;
using formats::manifestStage;
using formats::OpSpec;
using formats::parseStageDesc;
using formats::readManifest;
using formats::replicaSlice;
using formats::StageDesc;
using formats::WeightSpec;

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_STAGE_H
