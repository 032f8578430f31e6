build-there/src/cli/runload.o: src/cli/runload.c src/cli/runload.h \
 src/ckpt/run.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/data/tokenizer.h src/data/../core/core.h \
 src/backend/backend.h src/ckpt/gguf.h src/ckpt/tensormap.h \
 src/ckpt/safetensors.h
src/cli/runload.h:
src/ckpt/run.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/backend/backend.h:
src/ckpt/gguf.h:
src/ckpt/tensormap.h:
src/ckpt/safetensors.h:
