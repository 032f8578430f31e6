build-there/src/obs/plot.o: src/obs/plot.c src/obs/plot.h src/core/core.h
src/obs/plot.h:
src/core/core.h:
