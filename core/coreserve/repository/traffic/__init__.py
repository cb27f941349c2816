"""Traffic between a model's versions: the policy a model holds (weights for the requests that
name no version, a shadow copy to a candidate) and the canary rollout plan that moves it."""
