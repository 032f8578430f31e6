build-there/src/plan/plan.o: src/plan/plan.c src/plan/plan.h \
 src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/plan/gpus.h src/core/core.h \
 src/train/step.h src/parallel/dist.h src/parallel/../core/core.h
src/plan/plan.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/plan/gpus.h:
src/core/core.h:
src/train/step.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
