build-there/src/plan/gpus.o: src/plan/gpus.c src/plan/gpus.h \
 src/core/core.h /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h
src/plan/gpus.h:
src/core/core.h:
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:
