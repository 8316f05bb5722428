"""SageMaker's front door: /ping, /health, /live and /invocations in its three generation schemas
(LMI, OpenAI chat, OpenAI completion), with LMI's protocol, sessions and custom handler."""
