# Finds Debian's LLVM/MLIR 22 and pulls in the TableGen/AddLLVM/AddMLIR helpers.
# We link the single shared libMLIR.so (see README "Build notes"): on two cores
# linking four tools against ~400 static MLIR archives costs far more than the
# slightly slower start-up of the shared library.
if(NOT MLIR_DIR AND EXISTS /usr/lib/llvm-22/lib/cmake/mlir)
  set(MLIR_DIR /usr/lib/llvm-22/lib/cmake/mlir)
endif()
find_package(MLIR 22.1 REQUIRED CONFIG)
message(STATUS "Using MLIR ${MLIR_VERSION} from ${MLIR_DIR}")

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
set(LLVM_RUNTIME_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/bin)
set(LLVM_LIBRARY_OUTPUT_INTDIR ${CMAKE_BINARY_DIR}/lib)
set(MLIR_BINARY_DIR ${CMAKE_BINARY_DIR})
include(TableGen)
include(AddLLVM)
include(AddMLIR)

set(MLIR_LINK_MLIR_DYLIB ON)
set(LLVM_LINK_LLVM_DYLIB ON)

include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
include_directories(${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
link_directories(${LLVM_BUILD_LIBRARY_DIR})
separate_arguments(PIPEC_LLVM_DEFS NATIVE_COMMAND "${LLVM_DEFINITIONS}")
add_definitions(${PIPEC_LLVM_DEFS})

if(NOT LLVM_EXTERNAL_LIT)
  set(LLVM_EXTERNAL_LIT ${LLVM_TOOLS_BINARY_DIR}/lit)
endif()
