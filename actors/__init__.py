"""Ray hosts of the core, cut by the process each module runs in (`tests/test_imports.py` checks it):

- the driver's (`driver/`): which cluster a run joins (`cluster`), the run's actors started or
  borrowed and given back (`launch`, `crew`), the rounds begun in the driver and their hand-over
  (`handover`), following its rounds (`follow`), the warm pool's commands (`pool`), the local
  head `rayfl up` keeps (`head`);
- the coordinator actor's (`coordinator/`): the actor (`actor`), the Ray executor over the client
  actors (`executor`), the dashboard's series (`dashboard`);
- a client actor's (`client`);
- the warm pool's keeper's (`keeper`);
- leaves any of them reads: names every process agrees on (`names`) and every read of Ray's
  private state (`raystate`).

"The pool" means one thing: the cluster's pool of warm actors that runs borrow (`keeper`).
"""
