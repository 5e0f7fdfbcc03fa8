from monitor_agent.cli import main

raise SystemExit(main())
