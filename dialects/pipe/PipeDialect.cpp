//===- PipeDialect.cpp - pipe dialect registration ------------------------===//
#include "dialects/pipe/PipeDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace pipec::pipe;

#include "dialects/pipe/PipeDialect.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/pipe/PipeAttrs.cpp.inc"

void PipeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/pipe/PipeOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/pipe/PipeAttrs.cpp.inc"
      >();
}

LogicalResult PlanAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               StringAttr algorithm, DenseI64ArrayAttr first,
                               DenseI64ArrayAttr last,
                               DenseI64ArrayAttr replicas, llvm::APFloat) {
  if (first.size() != last.size() || first.size() != replicas.size())
    return emitError() << "plan: first, last and replicas must have one entry "
                          "per stage";
  if (first.empty())
    return emitError() << "plan: no stages";
  for (int64_t s = 0; s < first.size(); ++s) {
    if (first[s] > last[s])
      return emitError() << "plan: stage " << s << " is empty";
    if (s > 0 && first[s] != last[s - 1] + 1)
      return emitError() << "plan: stage " << s << " does not start where stage "
                         << s - 1 << " ends";
    if (replicas[s] < 1)
      return emitError() << "plan: stage " << s << " has no replica";
  }
  return success();
}
