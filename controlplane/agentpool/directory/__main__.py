from agentpool.directory.server import main

main()
