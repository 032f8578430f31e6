build-there/src/plan/mig.o: src/plan/mig.c src/plan/mig.h src/plan/gpus.h \
 src/core/core.h
src/plan/mig.h:
src/plan/gpus.h:
src/core/core.h:
