"""The fleet simulator (issue 25): simulated llama-servers behind the gateway's real scheduler, index
and a real Redis, at fleet sizes no machine here can run (`llamafleet bench simulate`)."""
