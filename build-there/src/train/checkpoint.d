build-there/src/train/checkpoint.o: src/train/checkpoint.c \
 src/ckpt/optim.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/ckpt/run.h src/ckpt/safetensors.h \
 src/train/train_impl.h src/train/step_graph.h src/train/step.h \
 src/parallel/dist.h src/parallel/../core/core.h src/train/train.h \
 src/backend/backend.h src/data/dataset.h src/core/core.h \
 src/data/tokenizer.h src/data/../core/core.h
src/ckpt/optim.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/ckpt/run.h:
src/ckpt/safetensors.h:
src/train/train_impl.h:
src/train/step_graph.h:
src/train/step.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/train/train.h:
src/backend/backend.h:
src/data/dataset.h:
src/core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
