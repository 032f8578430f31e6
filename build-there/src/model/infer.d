build-there/src/model/infer.o: src/model/infer.c src/model/infer.h \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/model/gpt.h src/model/../backend/backend.h src/model/../core/core.h
src/model/infer.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../core/core.h:
