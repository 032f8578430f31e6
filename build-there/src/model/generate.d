build-there/src/model/generate.o: src/model/generate.c \
 src/model/generate.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/model/infer.h src/backend/backend.h
src/model/generate.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/model/infer.h:
src/backend/backend.h:
