build-there/src/backend/tensor.o: src/backend/tensor.c \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
