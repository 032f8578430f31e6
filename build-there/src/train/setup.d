build-there/src/train/setup.o: src/train/setup.c src/ckpt/hf.h \
 src/ckpt/tensormap.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/data/tokenizer.h src/data/../core/core.h \
 src/ckpt/run.h src/train/exporter.h src/train/train.h \
 src/backend/backend.h src/data/dataset.h src/core/core.h \
 src/parallel/dist.h src/parallel/../core/core.h src/train/step.h \
 src/train/step_graph.h src/train/train_impl.h
src/ckpt/hf.h:
src/ckpt/tensormap.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/ckpt/run.h:
src/train/exporter.h:
src/train/train.h:
src/backend/backend.h:
src/data/dataset.h:
src/core/core.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/train/step.h:
src/train/step_graph.h:
src/train/train_impl.h:
