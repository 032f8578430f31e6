build-there/src/backend/backend.o: src/backend/backend.c \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/backend/plugin.h
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/backend/plugin.h:
