build-there/src/cli/tokenize.o: src/cli/tokenize.c src/cli/args.h \
 src/cli/commands.h src/cli/progress.h src/train/train.h \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/ckpt/run.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../core/core.h src/data/dataset.h src/core/core.h \
 src/data/tokenizer.h src/data/../core/core.h src/parallel/dist.h \
 src/parallel/../core/core.h src/train/step.h src/train/step_graph.h \
 src/data/pipeline.h
src/cli/args.h:
src/cli/commands.h:
src/cli/progress.h:
src/train/train.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/ckpt/run.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../core/core.h:
src/data/dataset.h:
src/core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/parallel/dist.h:
src/parallel/../core/core.h:
src/train/step.h:
src/train/step_graph.h:
src/data/pipeline.h:
