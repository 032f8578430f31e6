build-there/src/cli/export.o: src/cli/export.c src/ckpt/gguf.h \
 src/ckpt/tensormap.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/data/tokenizer.h src/data/../core/core.h \
 src/ckpt/hf.h src/ckpt/run.h src/cli/args.h src/cli/commands.h
src/ckpt/gguf.h:
src/ckpt/tensormap.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/ckpt/hf.h:
src/ckpt/run.h:
src/cli/args.h:
src/cli/commands.h:
