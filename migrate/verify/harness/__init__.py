"""What runs inside the processes ``dpmigrate verify`` starts: :mod:`.core` and one adapter per framework."""
