build-there/src/obs/rapl.o: src/obs/rapl.c src/obs/rapl.h src/core/core.h
src/obs/rapl.h:
src/core/core.h:
