build-there/src/obs/sbuf.o: src/obs/sbuf.c src/obs/sbuf.h src/core/core.h
src/obs/sbuf.h:
src/core/core.h:
