from sparklab.cli import main

raise SystemExit(main())
