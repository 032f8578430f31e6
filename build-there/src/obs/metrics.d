build-there/src/obs/metrics.o: src/obs/metrics.c src/obs/metrics.h \
 src/core/core.h src/obs/sbuf.h
src/obs/metrics.h:
src/core/core.h:
src/obs/sbuf.h:
