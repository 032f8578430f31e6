build-there/src/backend/cpu/cpu_gemm.o: src/backend/cpu/cpu_gemm.c \
 src/backend/cpu/cpu_gemm.h src/backend/cpu/cpu_math.h
src/backend/cpu/cpu_gemm.h:
src/backend/cpu/cpu_math.h:
