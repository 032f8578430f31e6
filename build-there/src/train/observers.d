build-there/src/train/observers.o: src/train/observers.c \
 src/model/generate.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/obs/metrics_log.h src/core/core.h \
 src/obs/plot.h src/train/train.h src/backend/backend.h src/ckpt/run.h \
 src/data/dataset.h src/data/tokenizer.h src/data/../core/core.h \
 src/parallel/dist.h src/parallel/../core/core.h src/train/step.h \
 src/train/step_graph.h
src/model/generate.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/obs/metrics_log.h:
src/core/core.h:
src/obs/plot.h:
src/train/train.h:
src/backend/backend.h:
src/ckpt/run.h:
src/data/dataset.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/train/step.h:
src/train/step_graph.h:
