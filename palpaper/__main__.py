from palpaper.cli import main

main()
