build-there/src/serve/engine.o: src/serve/engine.c src/serve/engine.h \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/data/tokenizer.h src/data/../core/core.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../core/core.h \
 src/serve/kv_cache.h src/core/core.h src/model/generate.h \
 src/model/infer.h
src/serve/engine.h:
src/backend/backend.h:
src/backend/../core/core.h:
src/backend/ops.h:
src/data/tokenizer.h:
src/data/../core/core.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../core/core.h:
src/serve/kv_cache.h:
src/core/core.h:
src/model/generate.h:
src/model/infer.h:
