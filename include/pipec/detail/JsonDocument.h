//===- JsonDocument.h - Opening checks of JSON documents ---*- C++ -*-===//
//
// Part of pipec. Used by the readers of lib/Cost and lib/Plan; needs
// nlohmann-json, which the public headers do not.
//
//===----------------------------------------------------------------------===//

#ifndef PIPEC_DETAIL_JSONDOCUMENT_H
#define PIPEC_DETAIL_JSONDOCUMENT_H

#include <nlohmann/json.hpp>

#include <string>

namespace pipec {
namespace detail {

/// Parses `text` into `doc` and checks that it is a JSON object whose
/// "format" is `format`. Returns "" when it is, else why not (without the
/// reader's prefix): not valid JSON, not an object, no "format" or another
/// one, each naming the format expected.
inline std::string openJsonDocument(const std::string &text, const char *format,
                                    nlohmann::json &doc) {
  doc = nlohmann::json::parse(text, /*cb=*/nullptr,
                              /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return "not valid JSON";
  if (!doc.is_object())
    return "top level must be a JSON object";
  auto found = doc.find("format");
  if (found == doc.end())
    return std::string("missing \"format\" (expected \"") + format + "\")";
  if (!found->is_string() || found->get<std::string>() != format)
    return "unsupported format " + found->dump() + " (expected \"" + format +
           "\")";
  return "";
}

} // namespace detail
} // namespace pipec

#endif // PIPEC_DETAIL_JSONDOCUMENT_H
