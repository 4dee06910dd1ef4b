/* Preloaded into the PyTorch 2.x peer (bench/torch2.sh) to test MKL's CPU dispatch on AMD: MKL
 * asks this function whether the CPU is a genuine Intel one and, when it is not, keeps to its
 * generic CPU branch (mkl_serv_cpu_detect() = 0 on an AVX-512 Zen 4, MKL_ENABLE_INSTRUCTIONS
 * ignored). Answering yes lets it dispatch by the instruction set alone (branch 7, its AVX-512
 * kernels). Not part of graft. */
int mkl_serv_intel_cpu_true(void) { return 1; }
