function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
function main(args) {
  const n = args.n === undefined ? 25 : args.n;
  return { n: n, fib: fib(n) };
}
