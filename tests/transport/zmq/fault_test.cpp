// placeholder
int cadence_zmq_rank_main(int, char**) { return 2; }
