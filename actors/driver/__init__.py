"""What runs in the driver's process (a `rayfl run`, a job's entry point, a Tune trial): which
cluster a run joins (`cluster`), a run on Ray (`launch`: its actors from `crew`, the rounds it
begins here meanwhile and their hand-over onto the actors from `handover`), following its rounds
(`follow`), the warm pool's commands (`pool`) and the local head `rayfl up` keeps (`head`)."""
