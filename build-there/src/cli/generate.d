build-there/src/cli/generate.o: src/cli/generate.c \
 /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h src/cli/args.h \
 src/cli/commands.h src/cli/generate.h src/serve/engine.h \
 src/backend/backend.h src/backend/../core/core.h src/backend/ops.h \
 src/data/tokenizer.h src/data/../core/core.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../core/core.h \
 src/cli/runload.h src/ckpt/run.h
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:
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
