"""What runs in the driver's process (a `rayfl run`, a job's entry point, a Tune trial): which
cluster a run joins (`cluster`), its actors (`launch`), following its rounds (`follow`), the warm
pool's commands (`pool`) and the local head `rayfl up` keeps (`head`)."""
