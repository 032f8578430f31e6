build-there/src/backend/cpu/cpu.o: src/backend/cpu/cpu.c \
 /tmp/tmp.dRF37eol5u/bundle/include/cblas.h \
 /tmp/tmp.dRF37eol5u/bundle/include/openblas_config.h \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/backend/cpu/cpu_attention.h src/backend/cpu/cpu_gemm.h \
 src/backend/cpu/cpu_math.h src/backend/cpu/cpu_paged.h
/tmp/tmp.dRF37eol5u/bundle/include/cblas.h:
/tmp/tmp.dRF37eol5u/bundle/include/openblas_config.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/backend/cpu/cpu_attention.h:
src/backend/cpu/cpu_gemm.h:
src/backend/cpu/cpu_math.h:
src/backend/cpu/cpu_paged.h:
