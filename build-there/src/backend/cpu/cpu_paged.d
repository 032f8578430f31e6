build-there/src/backend/cpu/cpu_paged.o: src/backend/cpu/cpu_paged.c \
 src/backend/cpu/cpu_math.h src/backend/backend.h \
 src/backend/../core/core.h src/backend/ops.h src/core/core.h \
 src/backend/cpu/cpu_paged.h
src/backend/cpu/cpu_math.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/core/core.h:
src/backend/cpu/cpu_paged.h:
