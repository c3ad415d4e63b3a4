from solver.cli import main

main()
