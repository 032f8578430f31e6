build-there/src/backend/cpu/cpu_attention.o: \
 src/backend/cpu/cpu_attention.c src/backend/cpu/cpu_attention.h \
 src/core/core.h src/backend/cpu/cpu_gemm.h src/backend/cpu/cpu_math.h
src/backend/cpu/cpu_attention.h:
src/core/core.h:
src/backend/cpu/cpu_gemm.h:
src/backend/cpu/cpu_math.h:
