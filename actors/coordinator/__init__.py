"""What runs in the coordinator actor's process: the actor (`actor`), the Ray executor over the
client actors (`executor`), and the dashboard's series of its rounds (`dashboard`)."""
