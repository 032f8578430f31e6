build-there/src/cli/plan_serve.o: src/cli/plan_serve.c src/cli/args.h \
 src/cli/commands.h src/cli/plan_report.h src/model/gpt.h \
 src/model/../backend/backend.h src/model/../backend/../core/core.h \
 src/model/../backend/ops.h src/model/../core/core.h src/plan/gpus.h \
 src/core/core.h src/plan/mig.h src/plan/plan.h
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
src/plan/plan.h:
