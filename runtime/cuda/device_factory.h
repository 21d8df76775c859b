//===- device_factory.h - The CUDA device, for core tests -------*- C++ -*-===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CUDA device's factory without CUDA's headers, so that tests of the
/// runtime core (the communicator contract) can run against the CUDA
/// device as well as the CPU one. Throws RtError naming why when no GPU is
/// visible ("no CUDA GPU is visible").
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_DEVICE_FACTORY_H
#define PIPEC_RUNTIME_CUDA_DEVICE_FACTORY_H

#include "core/device.h"

namespace pipec {
namespace cuda {

std::unique_ptr<rt::Device> makeCudaDevice(const rt::DeviceRequest &request);

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_DEVICE_FACTORY_H
