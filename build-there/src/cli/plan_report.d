build-there/src/cli/plan_report.o: src/cli/plan_report.c \
 src/cli/plan_report.h src/model/gpt.h src/model/../backend/backend.h \
 src/model/../backend/../core/core.h src/model/../backend/ops.h \
 src/model/../core/core.h src/plan/gpus.h src/core/core.h \
 /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h
src/cli/plan_report.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/plan/gpus.h:
src/core/core.h:
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:
