build-there/src/parallel/dist_mpi.o: src/parallel/dist_mpi.c
