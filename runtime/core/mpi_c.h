//===- mpi_c.h - The MPI C API, without the C++ bindings --------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Includes <mpi.h> for C++ translation units without OpenMPI's deprecated
/// C++ bindings (mpicxx.h), which would need libmpi_cxx at link time while
/// the runtime links only MPI::MPI_C. Include this instead of <mpi.h>.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_MPI_C_H
#define PIPEC_RUNTIME_CORE_MPI_C_H

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#endif // PIPEC_RUNTIME_CORE_MPI_C_H
