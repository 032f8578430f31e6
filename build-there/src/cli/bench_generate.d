build-there/src/cli/bench_generate.o: src/cli/bench_generate.c \
 src/cli/args.h src/cli/commands.h src/cli/generate.h src/serve/engine.h \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/data/tokenizer.h src/data/../core/core.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../core/core.h \
 src/cli/runload.h src/ckpt/run.h src/model/infer.h
src/cli/args.h:
src/cli/commands.h:
src/cli/generate.h:
src/serve/engine.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../core/core.h:
src/cli/runload.h:
src/ckpt/run.h:
src/model/infer.h:
