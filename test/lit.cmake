# lit + FileCheck tests of the importer, the dialects and every pass.
configure_lit_site_cfg(
  ${CMAKE_CURRENT_SOURCE_DIR}/lit.site.cfg.py.in
  ${CMAKE_CURRENT_BINARY_DIR}/lit.site.cfg.py
  MAIN_CONFIG ${CMAKE_CURRENT_SOURCE_DIR}/lit.cfg.py)
set(PIPEC_LIT_DEPENDS FileCheck not count pipec-opt pipec-translate pipec)
add_lit_testsuite(check-pipec-lit "Running the pipec lit tests"
  ${CMAKE_CURRENT_BINARY_DIR}
  DEPENDS ${PIPEC_LIT_DEPENDS})
# ctest runs the whole lit suite as one test (lit prints its own summary).
add_test(NAME lit
  COMMAND ${LLVM_EXTERNAL_LIT} -sv ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(lit PROPERTIES LABELS lit TIMEOUT 600
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
