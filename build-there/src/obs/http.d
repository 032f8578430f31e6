build-there/src/obs/http.o: src/obs/http.c src/obs/http.h src/core/core.h \
 /tmp/tmp.dRF37eol5u/bundle/include/microhttpd.h src/obs/sbuf.h
src/obs/http.h:
src/core/core.h:
/tmp/tmp.dRF37eol5u/bundle/include/microhttpd.h:
src/obs/sbuf.h:
