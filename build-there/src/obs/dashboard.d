build-there/src/obs/dashboard.o: src/obs/dashboard.c src/obs/dashboard.h \
 src/obs/http.h src/core/core.h src/obs/metrics.h src/obs/sbuf.h
src/obs/dashboard.h:
src/obs/http.h:
src/core/core.h:
src/obs/metrics.h:
src/obs/sbuf.h:
