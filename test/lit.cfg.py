# -*- Python -*-
# lit configuration of pipec: tests under test/ (Import, Dialect, Transforms).
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "PIPEC"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "unittests",
                   "e2e", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.pipec_obj_root, "test")

llvm_config.with_system_environment(["HOME", "PATH", "OMPI_ALLOW_RUN_AS_ROOT",
                                     "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"])
llvm_config.use_default_substitutions()

tool_dirs = [config.pipec_tools_dir, config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["pipec-opt", "pipec-translate", "pipec-conformance", "pipec"], tool_dirs)
llvm_config.add_tool_substitutions(["not", "count"], [config.llvm_tools_dir])
config.substitutions.append(("%python", config.python3))
config.substitutions.append(("%examples", os.path.join(config.pipec_src_root, "examples")))
config.substitutions.append(("%srcroot", config.pipec_src_root))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
