build-there/src/train/step.o: src/train/step.c src/train/step.h \
 src/parallel/dist.h src/parallel/../core/core.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../backend/../core/core.h \
 src/model/../backend/ops.h src/model/../core/core.h src/core/mem.h
src/train/step.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/core/mem.h:
