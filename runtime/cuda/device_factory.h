//===- device_factory.h - The CUDA device, for core tests -------*- C++ -*-===//
//
// Part of pipec's CUDA runtime.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CUDA device's and communicator's factories without CUDA's headers, so
/// that tests of the runtime core (the communicator contract) can run against
/// the CUDA device as well as the CPU one. Throws RtError naming why when no
/// GPU is visible ("no CUDA GPU is visible").
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_DEVICE_FACTORY_H
#define PIPEC_RUNTIME_CUDA_DEVICE_FACTORY_H

#include "core/device.h"

namespace pipec {
namespace cuda {

std::unique_ptr<rt::Device> makeCudaDevice(const rt::DeviceRequest &request);

/// The communicator of CUDA stage executables: MPI, with tensors between
/// ranks sharing a GPU moved by CUDA IPC (unless PIPEC_CUDA_IPC=0), and
/// NCCL's sums and messages when asked (comm_cuda.cpp).
std::unique_ptr<rt::Communicator> makeCudaCommunicator(int &argc, char **&argv);

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_DEVICE_FACTORY_H
