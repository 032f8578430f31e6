build-there/src/cli/sample.o: src/cli/sample.c src/cli/args.h \
 src/cli/commands.h src/cli/runload.h src/ckpt/run.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../backend/../core/core.h \
 src/model/../backend/ops.h src/model/../core/core.h src/data/tokenizer.h \
 src/data/../core/core.h src/model/generate.h
src/cli/args.h:
src/cli/commands.h:
src/cli/runload.h:
src/ckpt/run.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/model/generate.h:
