from sparklab.cli.main import main

raise SystemExit(main())
