build-there/src/backend/cuda/cuda_peak.o: src/backend/cuda/cuda_peak.c \
 src/backend/cuda/cuda_peak.h src/backend/backend.h \
 src/backend/../core/core.h src/backend/ops.h
src/backend/cuda/cuda_peak.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
