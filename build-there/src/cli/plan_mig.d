build-there/src/cli/plan_mig.o: src/cli/plan_mig.c \
 /tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h src/cli/args.h \
 src/cli/commands.h src/cli/plan_report.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../backend/../core/core.h \
 src/model/../backend/ops.h src/model/../core/core.h src/plan/gpus.h \
 src/core/core.h src/plan/mig.h
/tmp/tmp.dRF37eol5u/bundle/include/cjson/cJSON.h:
src/cli/args.h:
src/cli/commands.h:
src/cli/plan_report.h:
src/model/gpt.h:
src/model/../backend/backend.h:
src/model/../backend/../core/core.h:
src/model/../backend/ops.h:
src/model/../core/core.h:
src/plan/gpus.h:
src/core/core.h:
src/plan/mig.h:
