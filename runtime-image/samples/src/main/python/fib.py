def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def main(args):
    n = args.get("n", 20)
    return {"n": n, "fib": fib(n)}
